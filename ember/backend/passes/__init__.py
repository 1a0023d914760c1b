"""Graph passes on FX graphs before and after the ATen trace (each module says when it
runs; ``ember/backend/pipeline.py`` lists them in order)."""
