-- Schema version 4 (from 3): a campaign may search several template families at once
-- (`tune --space A.yaml --space B.yaml`). Each campaign lists its search spaces, one row per
-- family, with the text of each (for replay, report and export on another machine). For a
-- campaign of one family the row repeats the campaigns columns; for a mixed one, campaigns.family
-- names the families joined with '+' and campaigns.space_hash is the hash of the set.
-- Existing campaigns get the row of their one space.

CREATE TABLE campaign_spaces (
  campaign_id INTEGER NOT NULL REFERENCES campaigns (id) ON DELETE CASCADE,
  family      TEXT NOT NULL,                    -- kernel template of the space
  space_path  TEXT NOT NULL,
  space_hash  TEXT NOT NULL,                    -- content hash of the space file
  space_text  TEXT NOT NULL DEFAULT '',         -- the YAML ('' for campaigns from before version 3)
  PRIMARY KEY (campaign_id, family)
);

INSERT INTO campaign_spaces (campaign_id, family, space_path, space_hash, space_text)
  SELECT id, family, space_path, space_hash, space_text FROM campaigns;
