"""The `apexrl` command: one subcommand per role, and `launch` to start the roles of one machine."""
