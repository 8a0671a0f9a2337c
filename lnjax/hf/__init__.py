"""Hugging Face GPT-2 and BERT checkpoints: reading, converting, tokenizers, export, analysis.
"""
