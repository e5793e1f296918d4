"""Deployment targets past one machine: ``conveyor deploy kubernetes`` renders manifests.

:mod:`conveyor.deploy.kubernetes` turns a config (and the app's name) into Kubernetes
objects; :mod:`conveyor.cli.deploy` is the click command. Names that reach a broker
(streams, topics, consumer groups) come from the adapters' own code, never retyped.
"""
