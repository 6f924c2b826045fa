"""The tools above the decoding core: measure this machine (cost curves, cost model), choose the plan
fastest here, and show it (bench, demo, the command line). They import the core; the core never imports them."""
