"""The opt-in apex target (--amp apex): amp.initialize, amp.scale_loss, apex.parallel DDP.

Being written (issue 4); until then --amp apex adds no mixed precision."""

from __future__ import annotations

from ddpify.transforms.base import Context, Transform


class ApexTransform(Transform):
    name = "apex"

    def plan(self, ctx: Context) -> None:
        return None
