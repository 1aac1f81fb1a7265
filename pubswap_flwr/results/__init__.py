"""What reads a finished run: `pubswap verify` (its final adapter re-evaluated), `pubswap ask` (a question put to
it), and the checked reading of a run directory they share (verify_inputs). Reports are built by report/."""
