"""The Docker / BuildKit / registry boundary: everything that talks to an engine or a registry."""
