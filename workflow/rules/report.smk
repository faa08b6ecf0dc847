# The run's HTML report (self-contained), and its figures registered for `snakemake --report`.
FIGURES = ["val_per_generation", "training_curves", "lineage_tree", "findings_heatmap", "test_accuracy", "compute_per_arm"]


rule report:
    input:
        summary=f"{R}/summary.json",
        lineage=f"{R}/lineage.parquet",
    output:
        html=f"{R}/report.html",
        figures=[
            report(f"{R}/report/{name}.png", caption=f"../report/{name}.rst", category="EvoTrainer", subcategory="{run}")
            for name in FIGURES
        ],
    params:
        evo=EVO,
        run_dir=run_dir,
        figures=lambda wc: f"{run_dir(wc)}/report",
    benchmark:
        f"{R}/benchmarks/report.tsv"
    log:
        f"{R}/logs/report.log",
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} report --run-dir {params.run_dir} --out-html {output.html} --figures-dir {params.figures} > {log} 2>&1"


# `snakemake headline --cores 2`: the whole loop and the fixed-harness baseline under S seeds
# (search.headline_seeds), then the difference in test accuracy with a bootstrap interval.
rule headline:
    input:
        summaries=[f"{RESULTS}/{name}/summary.json" for name in HEADLINE_RUNS],
        reports=[f"{RESULTS}/{name}/report.html" for name in HEADLINE_RUNS],
        arms=[f"{RESULTS}/{name}/summary.json" for name in ARM_RUNS],
    output:
        json=f"{RESULTS}/{RUN}-headline/headline.json",
        png=report(f"{RESULTS}/{RUN}-headline/headline.png", caption="../report/headline.rst", category="Headline"),
    params:
        evo=EVO,
        arms=lambda wc, input: f"--arm-summaries {' '.join(input.arms)}" if input.arms else "",
    log:
        f"{RESULTS}/{RUN}-headline/headline.log",
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} headline --summaries {input.summaries} {params.arms} --out-json {output.json} --out-png {output.png} > {log} 2>&1"
