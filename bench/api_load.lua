-- wrk script for bench/api.py: every request gets an Idempotency-Key never sent before.
--
--   wrk -t 2 -c 64 -d 10s --latency -s bench/api_load.lua URL -- MODE PREFIX TEMPLATE BATCH_SIZE
--
-- MODE single: POST TEMPLATE as the body, with the key in the Idempotency-Key header.
-- MODE batch:  POST {"items":[{"idempotency_key":K,"request":TEMPLATE}, ...]}, BATCH_SIZE items.
-- TEMPLATE is one submission's JSON with {{KEY}} where the key goes (the key is fixed-width, so
-- every body has the same size). The bearer token comes from the environment (BENCH_TOKEN), so it
-- is not on a command line. A key is PREFIX .. thread (2 digits) .. counter (10 digits) [.. item].
--
-- done() prints one line, "WRK_RESULT {json}": status counts, wrk's errors, latency percentiles
-- (microseconds), and for batches the items answered 201, 200 and otherwise (counted in the
-- answers' bodies), with the first unexpected answer's beginning.

local threads = {}
local thread_count = 0

function setup(thread)
   thread_count = thread_count + 1
   thread:set("thread_number", thread_count)
   table.insert(threads, thread)
end

-- Per-thread state: globals, so that done() can read them through thread:get.
statuses = {}
items_created = 0
items_replayed = 0
items_other = 0
sample = ""
request_bytes = 0

local mode, prefix, parts, batch_size, headers
local counter = 0

local function split(text, marker)
   local out, start = {}, 1
   while true do
      local at = string.find(text, marker, start, true)
      if at == nil then
         table.insert(out, string.sub(text, start))
         return out
      end
      table.insert(out, string.sub(text, start, at - 1))
      start = at + #marker
   end
end

local function fill(key)
   local pieces = {parts[1]}
   for i = 2, #parts do
      pieces[#pieces + 1] = key
      pieces[#pieces + 1] = parts[i]
   end
   return table.concat(pieces)
end

function init(args)
   mode, prefix, batch_size = args[1], args[2], tonumber(args[4])
   parts = split(args[3], "{{KEY}}")
   assert(mode == "single" or mode == "batch", "MODE must be single or batch")
   assert(#parts >= 2, "TEMPLATE has no {{KEY}}")
   prefix = prefix .. string.format("%02d", thread_number)
   headers = {
      ["Host"] = wrk.host .. ":" .. wrk.port,
      ["Content-Type"] = "application/json",
      ["Authorization"] = "Bearer " .. (os.getenv("BENCH_TOKEN") or ""),
   }
end

function request()
   counter = counter + 1
   local key = prefix .. string.format("%010d", counter)
   local body
   if mode == "single" then
      headers["Idempotency-Key"] = key
      body = fill(key)
   else
      local items = {}
      for i = 1, batch_size do
         local item_key = key .. string.format("-%04d", i)
         items[i] = '{"idempotency_key":"' .. item_key .. '","request":' .. fill(item_key) .. '}'
      end
      body = '{"items":[' .. table.concat(items, ",") .. ']}'
   end
   request_bytes = #body
   return wrk.format("POST", wrk.path, headers, body)
end

local function count(text, needle)
   local found, start = 0, 1
   while true do
      local at = string.find(text, needle, start, true)
      if at == nil then
         return found
      end
      found = found + 1
      start = at + #needle
   end
end

function response(status, response_headers, body)
   statuses[status] = (statuses[status] or 0) + 1
   local unexpected = status < 200 or status > 299
   if mode == "batch" and status == 200 then
      local created = count(body, '{"status":201,"request":')
      local replayed = count(body, '{"status":200,"request":')
      items_created = items_created + created
      items_replayed = items_replayed + replayed
      items_other = items_other + batch_size - created - replayed
      unexpected = created + replayed ~= batch_size
   end
   if unexpected and sample == "" then
      sample = string.format("%d %s", status, string.sub(body or "", 1, 400))
   end
end

local function quoted(text)
   return '"' .. string.gsub(text, '[%c"\\]', function(c) return string.format("\\u%04x", string.byte(c)) end) .. '"'
end

function done(summary, latency, requests)
   local by_status, created, replayed, other, first, sent_bytes = {}, 0, 0, 0, "", 0
   for _, thread in ipairs(threads) do
      for status, n in pairs(thread:get("statuses")) do
         by_status[status] = (by_status[status] or 0) + n
      end
      created = created + thread:get("items_created")
      replayed = replayed + thread:get("items_replayed")
      other = other + thread:get("items_other")
      sent_bytes = math.max(sent_bytes, thread:get("request_bytes"))
      if first == "" then
         first = thread:get("sample")
      end
   end
   local status_fields = {}
   for status, n in pairs(by_status) do
      status_fields[#status_fields + 1] = string.format('"%d":%d', status, n)
   end
   local e = summary.errors
   io.write(string.format(
      'WRK_RESULT {"duration_us":%d,"responses":%d,"statuses":{%s},' ..
      '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
      '"latency_us":{"p50":%d,"p90":%d,"p99":%d,"p999":%d,"max":%d,"mean":%.1f},' ..
      '"items":{"created":%d,"replayed":%d,"other":%d},"request_bytes":%d,"sample":%s}\n',
      summary.duration, summary.requests, table.concat(status_fields, ","),
      e.connect, e.read, e.write, e.status, e.timeout,
      latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
      latency.max, latency.mean, created, replayed, other, sent_bytes, quoted(first)))
end
