// runs/s through LangGraph's JS client (@langchain/langgraph-sdk, the version the tests pin in
// tests/sdk/js/package-lock.json): `node throughput.mjs URL CONCURRENCY SECONDS`. Each of
// CONCURRENCY loops is its own client, creating a thread and streaming a run of `three`
// (`values`, `updates`) to its end, again and again, for SECONDS. Prints one JSON object: runs
// a second, errors, and this process's CPU in cores. Run by bench/serve/harness.py.

import { Client } from "@langchain/langgraph-sdk";

const [url, concurrency, seconds] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];
let done = 0;
let errors = 0;
const end = performance.now() + seconds * 1000;

async function loop() {
  const client = new Client({ apiUrl: url });
  while (performance.now() < end) {
    try {
      const { thread_id } = await client.threads.create();
      for await (const _ of client.runs.stream(thread_id, "three", { input: {}, streamMode: ["values", "updates"] })) {
        // Every event is read; none is kept.
      }
      done += 1;
    } catch (e) {
      // Counted and reported: the rate is of runs that ended.
      errors += 1;
      if (errors === 1) console.error(e);
    }
  }
}

const started = performance.now();
const cpu = process.cpuUsage();
await Promise.all(Array.from({ length: concurrency }, loop));
const wall = (performance.now() - started) / 1000;
const used = process.cpuUsage(cpu);
console.log(JSON.stringify({ runs_per_s: done / wall, errors, client_cpu: (used.user + used.system) / 1e6 / wall }));
