"""How the loop chooses: selection of a generation's candidates against its control, the trusted validity
gates that veto good-looking but invalid branches, the backtest of evolved diagnostics on archived
evidence, and the approvals (a person approves, revises or aborts) that can stop the loop between stages."""
