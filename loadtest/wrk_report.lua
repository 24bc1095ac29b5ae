-- wrk: print p50/p99/p99.9 in microseconds after the run.
done = function(summary, latency, requests)
  io.write(string.format("latency us: p50 %d  p99 %d  p99.9 %d\n",
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
