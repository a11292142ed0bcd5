"""The serving layer: what servers add around the engine (admission, deadlines, engine commands, metrics, the client seam)."""
