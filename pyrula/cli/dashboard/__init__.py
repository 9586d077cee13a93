"""The read-only dashboard ``pyrula dev`` serves: HTML pages and JSON over the Store
protocol, on the standard library's asyncio streams."""
