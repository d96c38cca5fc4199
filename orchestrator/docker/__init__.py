"""The only package that talks to a container engine (docker-py, and for listings and
execs hp's own client, wire.py): the provider interface (provider.py), its
implementation on one Docker engine (engine.py), typed views (views.py) and image
builds (images.py)."""
