"""Workflows served by the worker example (``python -m examples.worker_process``).

A module of ``@workflow`` definitions, as an app would keep them: importing it registers
them, and a worker started in the same process serves every registered workflow.
The steps only pretend to call services, so the example runs anywhere.
"""

from __future__ import annotations

from typing import Any

from pyrula.workflows import (
    Poison,
    RetryPolicy,
    StepContext,
    WorkflowContext,
    step,
    workflow,
)


@step(retry=RetryPolicy(max_attempts=5, initial_backoff=0.5, retryable=(ConnectionError,)))
def reserve_stock(ctx: StepContext, sku: str, quantity: int) -> dict[str, Any]:
    """Reserve stock (a sync step: it runs in the worker's thread pool)."""
    return {"sku": sku, "quantity": quantity, "reservation": f"res-{sku}-{quantity}"}


@step(timeout=10.0)
async def charge_card(ctx: StepContext, order_id: str, amount_cents: int) -> dict[str, Any]:
    """Charge the customer (an async step: cancelled if it runs over 10 s)."""
    if amount_cents <= 0:
        raise Poison(f"order {order_id}: amount must be positive, got {amount_cents}")
    return {"order_id": order_id, "charged": amount_cents, "attempt": ctx.attempt}


def shipping_label(order_id: str, reservation: str) -> str:
    return f"label:{order_id}:{reservation}"


@workflow(name="examples.fulfil_order")
async def fulfil_order(
    ctx: WorkflowContext, order_id: str, sku: str, quantity: int, amount_cents: int
) -> dict[str, Any]:
    """Reserve, charge, label. Each step runs once per run, even across worker crashes."""
    stock = await reserve_stock(sku, quantity)
    payment = await charge_card(order_id, amount_cents)
    label = await ctx.step("shipping_label", shipping_label, order_id, stock["reservation"])
    if not ctx.is_replaying:
        ctx.logger.info("order %s fulfilled", order_id)
    return {"order_id": order_id, "stock": stock, "payment": payment, "label": label}
