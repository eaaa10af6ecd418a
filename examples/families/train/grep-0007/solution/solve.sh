#!/bin/bash
grep retry notes.txt > result.txt
