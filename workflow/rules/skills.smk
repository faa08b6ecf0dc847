# After select: the generation's verified outcomes (promoted, vetoed, clearly lost) become skills in
# results/<run>/skills/ and the cross-run library (skills.library_dir). promote waits for it, so the
# next generation's agent can retrieve them.
localrules:
    skills,  # seconds of JSON work: not worth a cluster job


rule skills:
    input:
        selection=f"{R}/gen{{g}}/selection.json",
        diagnosis=f"{R}/gen{{g}}/diagnosis.json",
        candidates=f"{R}/gen{{g}}/candidates",
    output:
        f"{R}/gen{{g}}/skills.json",
    params:
        evo=EVO,
        conf=run_config,
        run_dir=run_dir,
    benchmark:
        f"{R}/benchmarks/gen{{g}}/skills.tsv"
    log:
        f"{R}/logs/gen{{g}}/skills.log",
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} skills --config {params.conf} --run-dir {params.run_dir} --selection {input.selection}"
        " --diagnosis {input.diagnosis} --candidates {input.candidates} --out {output} --generation {wildcards.g}"
        " > {log} 2>&1"
