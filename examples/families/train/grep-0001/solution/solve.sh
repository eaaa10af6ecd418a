#!/bin/bash
grep ok list.txt > answer.txt
