-- wrk script of bench/peer/dtmrs.sh: POSTs a 2-step saga with wait_result to DTM's
-- submit endpoint, a new gid per request.
--
--   wrk -t 2 -c 32 -d 15s -s saga.lua http://127.0.0.1:PORT -- PARTICIPANT RUN
--
-- PARTICIPANT: the participant's base URL with the run's path prefix, e.g.
-- http://127.0.0.1:8080/p/r1-idem; the steps go to PARTICIPANT/s1/action, /s1/compensate,
-- /s2/action, /s2/compensate. RUN: a tag unique to this wrk run, which begins each gid
-- (gid = RUN-<thread>-<counter>).
--
-- The one body suits both servers: each step carries its payload both as DTM's
-- `payloads[i]` (which idem reads) and as `steps[i].payload` (which dtmrs reads); each
-- server ignores the field it does not know. dtmrs ignores `wait_result`.
--
-- At the end one line `WRK_JSON {...}` carries the figures (latencies in microseconds).

local threads = {}
local next_id = 0

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

-- Globals, not locals: done() reads them from each thread with thread:get.
counter = 0
non2xx = 0
last_bad = ""
local template
local headers = { ["Content-Type"] = "application/json" }

function init(args)
  local participant = args[1]
  local run = args[2]
  if participant == nil or run == nil then
    error("usage: wrk ... -s saga.lua URL -- PARTICIPANT RUN")
  end
  local payload = '"{\\"amount\\":30}"'
  local function step(n)
    local base = participant .. "/s" .. n
    return '{"action":"' .. base .. '/action","compensate":"' .. base ..
      '/compensate","payload":' .. payload .. '}'
  end
  -- %s: the gid.
  template = '{"gid":"' .. run .. '-' .. id .. '-%d","trans_type":"saga","wait_result":true,' ..
    '"steps":[' .. step(1) .. ',' .. step(2) .. '],' ..
    '"payloads":[' .. payload .. ',' .. payload .. ']}'
end

function request()
  counter = counter + 1
  return wrk.format("POST", "/api/dtmsvr/submit", headers, string.format(template, counter))
end

function response(status, headers, body)
  if status < 200 or status > 299 then
    non2xx = non2xx + 1
    last_bad = status .. " " .. string.sub(body or "", 1, 200)
  end
end

local function json_string(s)
  s = string.gsub(s, '[%c"\\]', function(c)
    return string.format("\\u%04x", string.byte(c))
  end)
  return '"' .. s .. '"'
end

function done(summary, latency, requests)
  local bad, sent, sample = 0, 0, ""
  for _, thread in ipairs(threads) do
    bad = bad + (thread:get("non2xx") or 0)
    sent = sent + (thread:get("counter") or 0)
    local s = thread:get("last_bad")
    if s ~= nil and s ~= "" then sample = s end
  end
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"duration_us":%d,"requests":%d,"bytes":%d,"sent":%d,"non2xx":%d,' ..
    '"non2xx_sample":%s,"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"min":%d,"mean":%.1f,"max":%d,"p50":%d,"p90":%d,"p99":%d,"p999":%d}}\n',
    summary.duration, summary.requests, summary.bytes, sent, bad, json_string(sample),
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency.max, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9)))
end
