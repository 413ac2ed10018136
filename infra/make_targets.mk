# The platform's entry points; the Makefile includes this after defining PY, VENV and STAMP.
#   make demo     GRPO vs Ada-balance on the tiny model, embedded (SQLite MLflow, ephemeral Prefect)
#   make ui       Prefect + MLflow servers on 127.0.0.1, deployments from prefect.yaml, the ada-train
#                 concurrency limit, ADA_WORKERS (1) workers with --limit 1 (ADA_WORKER_GPUS=0,1,.. pins
#                 one per GPU) and a worker for compare/sweep parents; prints the URLs and the command that
#                 starts the weekly sweep's schedule (it ships paused). ADA_UI_HOST=<address> binds beyond
#                 127.0.0.1 and needs ADA_UI_USER + ADA_UI_PASSWORD (or _FILE) for both servers: infra/TEAM.md
#   make ui-stop  stop what `make ui` started
#   make ui-worker  training workers on this machine for a team `make ui` on another (infra/TEAM.md)
.PHONY: demo ui ui-stop ui-status ui-worker

demo: $(STAMP)
	$(PY) -m flows.demo $(DEMO_ARGS)

ui: $(STAMP)
	$(PY) infra/ui.py start

ui-stop:
	$(PY) infra/ui.py stop

ui-status:
	$(PY) infra/ui.py status

ui-worker: $(STAMP)
	$(PY) infra/ui.py worker
