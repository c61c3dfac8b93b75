"""Front ends: the CLI, the pytest plugin and the commands; they drive cells through the orchestrator."""
