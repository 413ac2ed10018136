# The platform's entry points; the Makefile includes this after defining PY, VENV and STAMP.
#   make demo     GRPO vs Ada-balance on the tiny model, embedded (SQLite MLflow, ephemeral Prefect)
#   make ui       Prefect + MLflow servers on 127.0.0.1, deployments from prefect.yaml, a worker
#   make ui-stop  stop what `make ui` started
.PHONY: demo ui ui-stop ui-status

demo: $(STAMP)
	$(PY) -m flows.demo $(DEMO_ARGS)

ui: $(STAMP)
	$(PY) infra/ui.py start

ui-stop:
	$(PY) infra/ui.py stop

ui-status:
	$(PY) infra/ui.py status
