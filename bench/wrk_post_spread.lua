-- bench/wrk_post.lua with every request on a key drawn at random (of all the keys), so the
-- requests of a key come over every connection, to whichever worker accepted it: the keys spread
-- over the workers as a load balancer or short client connections spread them. Arguments after
-- `--`: those of wrk_post.lua (the pause included).
local here = debug.getinfo(1, "S").source:sub(2):match("(.*/)") or "./"
dofile(here .. "wrk_post.lua")

local base_init = init

function init(args)
  base_init(args)
  math.randomseed(id * 7919 + 17)
  all = {}
  for k = 0, tonumber(args[1]) - 1 do
    all[#all + 1] = "/v1/sessions/" .. args[3] .. k .. "/messages"
  end
end

function request()
  sent = sent + 1
  local path = all[math.random(#all)]
  return wrk.format("POST", path, headers, body_of(sent))
end
