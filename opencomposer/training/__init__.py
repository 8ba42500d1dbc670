"""Training pieces shared by pretraining, SFT and RL: what no single trainer owns."""
