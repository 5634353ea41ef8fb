"""The localhost launcher: one command starts a whole cluster (`sync-mnist-cluster`)."""
