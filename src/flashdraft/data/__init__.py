"""Chat datasets: sources, tokenisation with loss masks, and response regeneration with the target."""
