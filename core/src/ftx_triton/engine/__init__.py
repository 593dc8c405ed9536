"""The engine: the stage façade, the pipeline that orders the stages, and core's default stage plugins."""
