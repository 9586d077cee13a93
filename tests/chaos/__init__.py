"""Crash and fault-injection tests against real worker processes (marked ``slow``)."""
