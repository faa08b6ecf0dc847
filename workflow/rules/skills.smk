# After select: the generation's verified outcomes (promoted, vetoed, clearly lost) become skills in
# results/<run>/skills/ and the cross-run library (skills.library_dir). promote waits for it, so the
# next generation's agent can retrieve them.
localrules:
    skills,  # seconds of JSON work: not worth a cluster job


rule skills:
    input:
        selection=P.selection,
        diagnosis=P.diagnosis,
        candidates=P.candidates,
    output:
        P.gen_skills,
    params:
        evo=EVO,
        conf=run_config,
        run_dir=run_dir,
    benchmark:
        P("gen_benchmark", job="skills")
    log:
        P("gen_log", job="skills"),
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} skills --config {params.conf} --run-dir {params.run_dir} --selection {input.selection}"
        " --diagnosis {input.diagnosis} --candidates {input.candidates} --out {output} --generation {wildcards.g}"
        " > {log} 2>&1"
