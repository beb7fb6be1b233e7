"""The engine thread's posts to the event loop (``server/worker.py``'s mailbox): outside a step each
post reaches its job's queue at once; during a step (``held_posts``) nothing reaches the loop until
the step ends, then everything at once, in order, with one wake-up of the loop; a stream's later
text waits for a later step's end up to ``stream_interval`` after the last wake-up, its first text
and its end never."""

from __future__ import annotations

import asyncio
import threading
import time

from localspec.runtime.engine import GenerationConfig
from localspec.core.events import DoneEvent
from localspec.server.worker import Finished, Job, Started, Text, flush_posts, held_posts


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


def test_a_stream_s_later_text_joins_the_next_steps_until_the_interval_but_first_text_and_end_go_at_once():
    async def main():
        loop = asyncio.get_running_loop()
        job = Job("hi", GenerationConfig(max_tokens=8), param="prompt")
        job.stream_interval = 0.3
        wakes = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a, **k: (wakes.append(a[0]), real(*a, **k))[1]

        def step(*items):
            def run():
                with held_posts():
                    for item in items:
                        job.post(item)
            _from_engine_thread(run)

        async def arrived() -> list:
            await asyncio.sleep(0.05)   # a wake-up on its way runs by then
            items = []
            while not job.events.empty():
                items.append(job.events.get_nowait())
            return items

        _from_engine_thread(lambda: job.post(Started(2)))     # admission, outside a step: at once
        assert isinstance((await arrived())[0], Started)
        step(Text("a"))                                       # the first text: at the step's end
        assert [i.text for i in await arrived()] == ["a"]
        t0 = time.monotonic()
        step(Text("b"))                                       # later texts wait for later steps' ends ...
        step(Text("c"))
        assert await arrived() == [] and time.monotonic() - t0 < 0.3
        await asyncio.sleep(0.3)
        step(Text("d"))                                       # ... until the interval has passed: all at once
        assert [i.text for i in await arrived()] == ["b", "c", "d"]
        step(Text("e"))
        assert await arrived() == []
        flush_posts()                                         # the engine going idle lets nothing wait
        assert [i.text for i in await arrived()] == ["e"]
        step(Text("f"))
        step(Text("g"), Finished(DoneEvent("abcdefg", [], "stop", None), 0))   # the end takes what waits
        got = await arrived()
        assert [getattr(i, "text", None) for i in got] == ["f", "g", None] and isinstance(got[-1], Finished)
        assert len(wakes) == 5   # Started, a, b-d, e (flushed), f-end

    asyncio.run(main())


def test_with_no_interval_every_step_s_text_reaches_the_loop_at_its_end():
    async def main():
        job = Job("hi", GenerationConfig(max_tokens=8), param="prompt")
        for text in "abc":
            def run(text=text):
                with held_posts():
                    job.post(Text(text))
            _from_engine_thread(run)
            assert (await asyncio.wait_for(job.events.get(), 5)).text == text

    asyncio.run(main())
