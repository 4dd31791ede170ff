"""The Celery tasks' names: how the web side and the workers refer to them.

The web process sends tasks by name (`dispatch.send`), so it never imports the task bodies
or the worker package; `playground/tasks.py` registers each body under its name here.
"""

RUN_GENERATION = "playground.tasks.run_generation"
RUN_CHOICES = "playground.tasks.run_choices"
RUN_PREFILL = "playground.tasks.run_prefill"
RUN_DECODE = "playground.tasks.run_decode"
RUN_TEST_LOAD = "playground.tasks.run_test_load"
INSPECT_GENERATION = "playground.tasks.inspect_generation"
