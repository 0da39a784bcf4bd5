"""FixedBatchLoss: the loss of one held-out batch, the same batch at step 0 and after every n-th step."""

import pytest
import torch

from study.callbacks import FixedBatchLoss
from tests.callback_helpers import make_trainer, scalars, token_loader
from tests.test_callbacks_baseline import module


def test_fixed_batch_loss_is_the_first_validation_batch_at_every_step(tmp_path):
    reference = module()
    first = next(iter(token_loader(seed=1, vocab=64)))
    reference.eval()
    with torch.no_grad():
        step0 = float(reference.loss(first))
    trained = module()
    trained.model.train()
    make_trainer(tmp_path, [FixedBatchLoss(every_n_steps=2)], max_steps=4).fit(
        trained, token_loader(n=8, vocab=64), token_loader(seed=1, vocab=64)
    )
    logged = scalars(tmp_path)["train/fixed_batch_loss"]
    assert [s for s, _ in logged] == [0, 2, 4]
    assert logged[0][1] == pytest.approx(step0, rel=1e-6)
    assert logged[-1][1] != pytest.approx(logged[0][1], rel=1e-4)  # the same batch, moved weights
    assert trained.model.training  # train mode restored
    with pytest.raises(ValueError, match="every_n_steps must be an integer >= 1, got 0"):
        FixedBatchLoss(every_n_steps=0)
