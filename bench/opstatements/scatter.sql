-- Transitions move tuple versions: three rounds, each rewriting a third of
-- the rows (chosen by hash) and vacuuming, so later versions land in freed
-- space elsewhere in the heap, as the hot path's non-HOT updates do.
SET search_path = :schema;
UPDATE :tbl SET fence = fence + 1 WHERE abs(hashint8(id + 1)) % 3 = 0;
VACUUM :tbl;
UPDATE :tbl SET fence = fence + 1 WHERE abs(hashint8(id + 2)) % 3 = 0;
VACUUM :tbl;
UPDATE :tbl SET fence = fence + 1 WHERE abs(hashint8(id + 3)) % 3 = 0;
VACUUM ANALYZE :tbl;
