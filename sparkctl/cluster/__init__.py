"""Serving one recipe across Sparks: the nodes, what each one has, and what runs on each.

Every node is described from its own sysfs and its own commands (never from the head's), because the
cable can sit on a different port and the GID table differs per node; see the README's "Two Sparks".
"""
