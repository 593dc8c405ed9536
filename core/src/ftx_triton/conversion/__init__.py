"""Model families and their tensor tables: Hugging Face checkpoints -> FasterTransformer files and back."""
