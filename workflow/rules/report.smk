# The run's HTML report (self-contained), and its figures registered for `snakemake --report`.
FIGURES = ["val_per_generation", "training_curves", "lineage_tree", "findings_heatmap", "test_accuracy", "compute_per_arm"]


rule report:
    input:
        summary=P.summary,
        lineage=P.lineage,
    output:
        html=P.report,
        figures=[
            report(P("figure", figure=name), caption=f"../report/{name}.rst", category="EvoTrainer", subcategory="{run}")
            for name in FIGURES
        ],
    params:
        evo=EVO,
        run_dir=run_dir,
        figures=lambda wc: str(layout(wc).figures),
    benchmark:
        P("benchmark", job="report")
    log:
        P("log", job="report"),
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} report --run-dir {params.run_dir} --out-html {output.html} --figures-dir {params.figures} > {log} 2>&1"


# `snakemake headline --cores 2`: the whole loop and the fixed-harness baseline under S seeds
# (search.headline_seeds), then the difference in test accuracy with a bootstrap interval.
rule headline:
    input:
        summaries=[str(run_layout(name).summary) for name in HEADLINE_RUNS],
        reports=[str(run_layout(name).report) for name in HEADLINE_RUNS],
        arms=[str(run_layout(name).summary) for name in ARM_RUNS],
    output:
        json=str(HEADLINE.headline_json),
        png=report(str(HEADLINE.headline_png), caption="../report/headline.rst", category="Headline"),
    params:
        evo=EVO,
        arms=lambda wc, input: f"--arm-summaries {' '.join(input.arms)}" if input.arms else "",
    log:
        str(HEADLINE.headline_log),
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} headline --summaries {input.summaries} {params.arms} --out-json {output.json} --out-png {output.png} > {log} 2>&1"
