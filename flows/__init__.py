"""Prefect flows over the tasks: curate, train, evaluate, compare, sweep; plus tracking and the report."""
