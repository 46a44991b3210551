-- bench/wrk_post_spread.lua with a pause before each request of a connection (wrk's `delay`
-- hook): keys drawn at random, under a load below what the server can take. Arguments after `--`:
-- those of wrk_post.lua (the ids flag included), then the pause in milliseconds.
local here = debug.getinfo(1, "S").source:sub(2):match("(.*/)") or "./"
dofile(here .. "wrk_post_spread.lua")

local spread_init = init

function init(args)
  spread_init(args)
  pause_ms = tonumber(args[6]) or 0
end

function delay()
  return pause_ms
end
