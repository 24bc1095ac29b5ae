-- wrk: signed-in traffic from 100,000 users in 1,000 organisations, so each
-- request is two descriptors on distinct keys.
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/items", {
    ["x-user-id"] = "u" .. (n % 100000),
    ["x-org-id"] = "o" .. (n % 1000),
  })
end
done = function(summary, latency, requests)
  io.write(string.format("latency us: p50 %d  p99 %d  p99.9 %d\n",
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
