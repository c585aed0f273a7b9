-- take.lua: the driver of the limiter script, appended after the algorithm
-- chunks (script.go assembles them; each algorithm's file becomes
-- algorithms[name]). It decides every key first and writes only when every key
-- allows the request: all-or-nothing, so a request rejected by one limit
-- consumes nothing from the others.
--
-- KEYS[i]    the state key of request i.
-- ARGV       five values per key: algorithm, limit, period (µs), burst, hits.
-- Returns    four integers per key: allowed (1|0), remaining, reset_after (µs),
--            retry_after (µs). Rounding and clamping happen here, once.

-- Redis < 5 replicates scripts verbatim, which forbids writes after TIME;
-- newer servers replicate effects anyway (the call is a no-op there).
if redis.replicate_commands then
	redis.replicate_commands()
end

local MAX_US = 9000000000000000 -- ~285 years: fits int64 ns in Go and a double exactly

local function clamp(x, lo, hi)
	if x ~= x or x < lo then -- x ~= x: NaN
		return lo
	end
	if x > hi then
		return hi
	end
	return x
end

local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local results = {}
local cache = {}
local all = true
for i, key in ipairs(KEYS) do
	local base = (i - 1) * 5
	local name = ARGV[base + 1]
	local algorithm = algorithms[name]
	if algorithm == nil then
		return redis.error_reply("ERR sluice limiter: unknown algorithm " .. tostring(name))
	end
	local r = algorithm(key, now,
		tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3]),
		tonumber(ARGV[base + 4]), tonumber(ARGV[base + 5]), cache)
	results[i] = r
	if not r.allowed then
		all = false
	end
end

if all then
	for i = 1, #results do
		if results[i].write then
			results[i].write()
		end
	end
end

local out = {}
for i, r in ipairs(results) do
	local burst = tonumber(ARGV[(i - 1) * 5 + 4])
	local remaining, reset = r.remaining, r.reset
	if not all then
		remaining, reset = r.remaining_now, r.reset_now
	end
	local allowed, retry = 1, 0
	if not r.allowed then
		-- A rejection always says to wait at least 1 µs.
		allowed, retry = 0, clamp(math.ceil(r.retry), 1, MAX_US)
	end
	local n = #out
	out[n + 1] = allowed
	out[n + 2] = clamp(math.floor(remaining), 0, burst)
	out[n + 3] = clamp(math.ceil(reset), 0, MAX_US)
	out[n + 4] = retry
end
return out
