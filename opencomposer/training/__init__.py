"""Training pieces that pretraining, SFT and the RL trainer share (shared-prefix packing and its
segment attention, the learning-rate schedule, the metrics writer): what no single trainer owns.
It sits below pretrain/ and rl/ so neither imports the other."""
