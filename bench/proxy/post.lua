-- wrk script of the proxy benchmark: every request is the same 1 KB
-- non-streaming chat completion (1,024 bytes of JSON body), the size the
-- benchmark compares proxies on.
local head = '{"model":"bench","max_tokens":200,"stream":false,"messages":[{"role":"user","content":"'
local tail = '"}]}'
local filler = string.rep("the quick brown fox jumps over the lazy dog ", 30)
local body = head .. string.sub(filler, 1, 1024 - #head - #tail) .. tail
assert(#body == 1024, "body is " .. #body .. " bytes, want 1024")

wrk.method = "POST"
wrk.body = body
wrk.headers["Content-Type"] = "application/json"
