"""Delays: the conversion-delay models, what anonymous policies must know of them, the observed tail of
each arm, and the delay-corrected pull count Ñ that the attributed policies divide by."""
