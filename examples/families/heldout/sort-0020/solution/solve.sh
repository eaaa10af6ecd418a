#!/bin/bash
sort list.txt > answer.txt
