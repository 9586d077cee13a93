from pyrula_compat import shared_task


@shared_task
def shop_total(a, b):
    return a + b
