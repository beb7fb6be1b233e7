"""The engine thread's posts to the event loop (``server/worker.py``'s mailbox): outside a step each
post reaches its job's queue at once; during a step (``held_posts``) nothing reaches the loop until
the step ends, then everything at once, in order, with one wake-up of the loop."""

from __future__ import annotations

import asyncio
import threading
import time

from localspec.runtime.engine import GenerationConfig
from localspec.server.worker import Job, Text, held_posts


def _from_engine_thread(fn) -> None:
    thread = threading.Thread(target=fn)
    thread.start()
    thread.join()


def test_posts_held_during_a_step_reach_the_loop_at_its_end_in_order_with_one_wake_up():
    async def main():
        loop = asyncio.get_running_loop()
        jobs = [Job("hi", GenerationConfig(max_tokens=4), param="prompt") for _ in range(4)]
        wakes = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a, **k: (wakes.append(a[0]), real(*a, **k))[1]

        _from_engine_thread(lambda: jobs[0].post(Text("a")))   # outside a step: at once
        assert (await asyncio.wait_for(jobs[0].events.get(), 5)).text == "a" and len(wakes) == 1

        step_over = threading.Event()

        def step():
            with held_posts():
                for i, job in enumerate(jobs):        # each slot's settle posts its text
                    job.post(Text(f"{i}-x"))
                    job.post(Text(f"{i}-y"))
                time.sleep(0.2)                       # the rest of the step: the loop is left alone
                step_over.set()

        thread = threading.Thread(target=step)
        thread.start()
        while not step_over.is_set():
            assert all(job.events.empty() for job in jobs)   # nothing reached the loop mid-step
            await asyncio.sleep(0.01)
        thread.join()
        got = [[(await asyncio.wait_for(job.events.get(), 5)).text for _ in range(2)] for job in jobs]
        assert got == [[f"{i}-x", f"{i}-y"] for i in range(4)]
        assert len(wakes) == 2   # the post before the step, and the step's end: once for 8 items

    asyncio.run(main())
