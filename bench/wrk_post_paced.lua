-- bench/wrk_post.lua with a pause before each request of a connection: a load below what the
-- server can take (wrk's `delay` hook). Arguments after `--`: those of wrk_post.lua (the ids flag
-- included), then the pause in milliseconds.
local here = debug.getinfo(1, "S").source:sub(2):match("(.*/)") or "./"
dofile(here .. "wrk_post.lua")

local base_init = init

function init(args)
  base_init(args)
  pause_ms = tonumber(args[6]) or 0
end

function delay()
  return pause_ms
end
