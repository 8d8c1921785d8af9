"""GenAI pipelines (genai_config.json and inference_metadata.yaml packages).

This package is where composite GenAI packages are run; it currently holds
no components.
"""
