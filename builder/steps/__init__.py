"""The pipeline steps, one module each; see builder/steps/registry.py."""
