-- POST bodies for bench.gateway_ingest under wrk: one key per connection.
--
-- wrk's Lua has no per-connection hook, so the bench runs one wrk thread per connection (or, past
-- 64 connections, a few connections per thread, each thread owning a disjoint set of keys that
-- it rotates through, so no two requests in flight share a key unless there are fewer keys than
-- connections). Arguments after `--`: keys, threads, the URL-encoded key prefix, a tag that
-- keeps message texts of different phases apart, 1 to send each message with a
-- `client_message_id` of its own (the tag, the thread, the count: the retry-safe way to post),
-- and optionally a pause in milliseconds each connection waits before each request (wrk's `delay`
-- hook): a paced load, below what the server can take.
--   wrk -t 64 -c 64 -d 10s --timeout 10s -s bench/wrk_post.lua http://127.0.0.1:PORT \
--       -- 64 64 agent%3Amain%3Abench%3Adm%3Ac1k r1 1 [30]

local next_id = 0

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
end

function init(args)
  local keys = tonumber(args[1])
  local threads = tonumber(args[2])
  local prefix = args[3]
  tag = args[4] or "run"
  with_ids = args[5] == "1"
  paths = {}
  if keys <= threads then
    paths[1] = "/v1/sessions/" .. prefix .. (id % keys) .. "/messages"
  else
    for k = id, keys - 1, threads do
      paths[#paths + 1] = "/v1/sessions/" .. prefix .. k .. "/messages"
    end
  end
  sent = 0
  headers = {["Content-Type"] = "application/json"}
  pause_ms = tonumber(args[6]) or 0
  if pause_ms > 0 then
    -- defined only when paced: wrk looks for `delay` after init, and with it sends every request
    -- through a timer, even one of 0 ms
    function delay()
      return pause_ms
    end
  end
end

-- the body of this thread's request number `sent` (with its own client_message_id when asked)
function body_of(sent)
  local body = '{"content": "message ' .. sent .. ' of ' .. tag .. ' from thread ' .. id
    .. ': the quick brown fox jumps over the lazy dog"'
  if with_ids then
    return body .. ', "client_message_id": "' .. tag .. '-' .. id .. '-' .. sent .. '"}'
  end
  return body .. '}'
end

function request()
  sent = sent + 1
  local path = paths[(sent - 1) % #paths + 1]
  return wrk.format("POST", path, headers, body_of(sent))
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "NEOTASK-WRK requests=%d duration_us=%d status=%d connect=%d read=%d write=%d timeout=%d"
      .. " p50_us=%d p90_us=%d p99_us=%d max_us=%d mean_us=%d\n",
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
