"""Experiments (root only for the testbed): the bench, the straggler and scaling studies."""
