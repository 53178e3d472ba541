"""The parity ladder's verdicts: the noise-aware criteria and tolerance profiles (criteria, parity), the input
sets (images, inputs, photos/), the float64 ground truth and its cache (truth_cache), the hops (hops), the feature
probe (probe), localization of a failed hop (localize), the equivalence gate (equivalence), precision emulation
(emulate), stored-weight checks (weight_check), fp16 range analysis (fp16_ranges), the sample-count rule
(parity_cost) and the class names an artifact carries (classes).
"""
