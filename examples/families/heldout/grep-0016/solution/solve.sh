#!/bin/bash
grep retry list.txt > result.txt
