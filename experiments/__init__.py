"""Experiment harnesses: the fidelity yardstick (search errors against full softmax), the methods bench, the
map tuner and Amer et al.'s tables. They measure the product; the product never imports them."""
