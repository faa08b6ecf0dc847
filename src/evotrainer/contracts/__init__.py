"""The data contracts, one module each: what a harness, an evidence table, a candidate, a lineage row, a
skill and a task are, with their validation. Everything else imports these and nothing here imports a
stage, a backend or an agent: a contract is the shared language of the loop and of outside trainers."""
