"""The frozen model: a causal LM measured without training, on text windows.

`load` gets the model, its tokenizer and the text's documents (one set of checks, one input error) and draws the
text windows; `probe/` is `study probe` (gradients, the attention Jacobian and the W_q/W_k Hessian against T) and
`analysis/` is `study analyze` (the paper's Algorithms 1-5 and Lemma 1), both measurements of a model loaded here.
"""
