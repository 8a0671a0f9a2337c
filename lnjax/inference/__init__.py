"""Using a trained run: beam search, BLEU evaluation, predictions, translation, export.
"""
